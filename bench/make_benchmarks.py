#!/usr/bin/env python3
"""Generate BENCHMARKS.md from the section templates in bench/benchmarks/ and the saved results.

    python3 bench/make_benchmarks.py            # write BENCHMARKS.md
    python3 bench/make_benchmarks.py --check    # exit 1 (with a diff) if BENCHMARKS.md is out of date
    python3 bench/make_benchmarks.py --sources  # which results each template reads ("prose" if none)

Templates are markdown files, `bench/benchmarks/*.md`, joined in file-name order with one blank
line between them. To add a section, write `bench/benchmarks/NN-name.md` (NN places it: the
sections today are 00-intro .. 90-hardening), save its results under `bench/results/`, put each
figure's command beside it, run this script and commit the template, the results and
BENCHMARKS.md together. Text pasted into BENCHMARKS.md itself fails the check: move it into a
template. A template with no placeholder is copied as it is, so a section of plain
prose is a template already. A placeholder `{{NAME ARG ...}}` (arguments split like a shell
line, so quote one that holds spaces) is replaced by what it renders from files under the
repository root:

    {{include FILE}}            the file's text (a markdown fragment a benchmark script wrote)
    {{include FILE table}}      only the first markdown table in it
    {{ppl_table FILE}}          the table of a `tq perplexity --sweep --json` file (bench/llm_tables.py)
    {{speed_table FILE}}        the table of a `tq bench model --json` file (bench/llm_tables.py)
    {{kv_bytes_table FILE}}     KV bytes held per row of a `tq bench model --json` file, beside a
                                cache that keeps every token (bench/llm_tables.py)
    {{niah_table GLOB}}         one row per `tq niah --json` file matching GLOB (bench/llm_tables.py)
    {{attention_table FILE...}} `tq bench attention --json` runs side by side, one column per run
    {{attention_types_table FILE}} one `tq bench attention --json` run of many types, one row each
    {{value FILE PATH [FORMAT]}} one number or string of a JSON file, formatted with a Python
                                format spec (`+.2f`, `.4f`; `%.2f` multiplies by 100 first,
                                `MiB.2f` divides by 2^20)
    {{values FORMAT PATH FILE...}} PATH of each file, formatted, joined by " / "
    {{mean FORMAT PATH FILE...}}   the mean of PATH over the files (e.g. over rotation seeds)
    {{range FORMAT PATH FILE...}}  "min-max" of PATH over the files (one value if they print alike)
    {{sum FORMAT PATH FILE...}}    the sum of PATH over the files (e.g. needles passed over seeds)

FILE arguments of values / mean / range / sum may be globs (each expanded in sorted order), and
`FILE#PATH` reads that file at its own PATH (a file of another layout in the same row).

PATH is dot-separated keys and list indices; a `[key.sub=VALUE]` segment picks the first list
element whose `key.sub` equals VALUE, e.g. `results[kv.label=q4_0h].ppl_delta_pct`.
"""
import argparse
import difflib
import glob
import json
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llm_tables  # noqa: E402

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)


class TemplateError(Exception):
    pass


def _path(root, rel):
    p = os.path.join(root, rel)
    if not os.path.exists(p):
        raise TemplateError(f"no such file: {rel}")
    return p


def _lookup(obj, path):
    for seg in re.findall(r"\[[^\]]*\]|[^.\[\]]+", path):
        if seg.startswith("["):
            key, _, want = seg[1:-1].partition("=")
            if not isinstance(obj, list):
                raise TemplateError(f"{seg}: not a list")
            for item in obj:
                try:
                    if str(_lookup(item, key)) == want:
                        obj = item
                        break
                except TemplateError:
                    pass
            else:
                raise TemplateError(f"no element with {key} = {want!r}")
        elif isinstance(obj, list):
            try:
                obj = obj[int(seg)]
            except (ValueError, IndexError):
                raise TemplateError(f"bad list index {seg!r}")
        elif isinstance(obj, dict):
            if seg not in obj:
                raise TemplateError(f"no key {seg!r}")
            obj = obj[seg]
        else:
            raise TemplateError(f"{seg!r}: not an object")
    return obj


def _format(v, spec):
    if spec is None:
        return str(v)
    try:
        if spec.startswith("%"):
            return format(100 * v, spec[1:])
        if spec.startswith("MiB"):
            return format(v / 2**20, spec[3:])
        return format(v, spec)
    except (TypeError, ValueError) as e:
        raise TemplateError(f"cannot format {v!r} as {spec!r}: {e}")


def attention_table(root, files):
    runs = [json.load(open(_path(root, f))) for f in files]
    n = len(runs)
    runs_label = " / ".join(str(i + 1) for i in range(n))
    out = [f"| kv | kernel | threads | ms/step, median of {runs[0]['steps']} (run {runs_label}) | "
           f"speedup vs f16 ({runs_label}) | bytes/token (1 layer, K+V, {runs[0]['n_kv_heads']} kv heads) | "
           "K bytes per head vector | rel_err vs exact f32 | timed kernel vs attention_ref | "
           "float kernel vs attention_ref | append 1 token (us) |",
           "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(runs[0]["results"]):
        rows = [run["results"][i] for run in runs]
        out.append(f"| {r['kv']} | {r['kernel']} | {r['threads']} | "
                   + " / ".join(f"{x['ms_per_step']:.1f}" for x in rows) + " | "
                   + " / ".join(f"{x['speedup_vs_f16']:.2f}x" for x in rows) + " | "
                   f"{r['bytes_per_token']:.0f} | {r['k_bytes_per_head']} | {r['rel_err']:.3g} | "
                   f"{r['rel_err_fused_vs_ref']:.2g} | {r['rel_err_float_vs_ref']:.2g} | "
                   f"{r['append_us_per_token']:.1f} |")
    return "\n".join(out)


def attention_types_table(root, f):
    run = json.load(open(_path(root, f)))
    out = [f"| kv (K:V) | kernel | ms/step (median of {run['steps']}) | vs f16 | K / V bytes per head vector | "
           "rel_err vs exact f32 | fused vs attention_ref | append 1 token (us) |",
           "|---|---|---:|---:|---|---:|---:|---:|"]
    for r in run["results"]:
        out.append(f"| {r['kv']} | {r['kernel']} | {r['ms_per_step']:.1f} | {r['speedup_vs_f16']:.2f}x | "
                   f"{r['k_bytes_per_head']} / {r['v_bytes_per_head']} | {r['rel_err']:.3g} | "
                   f"{r['rel_err_fused_vs_ref']:.2g} | {r['append_us_per_token']:.1f} |")
    return "\n".join(out)


def render_placeholder(root, text, sources):
    try:
        args = shlex.split(text)
    except ValueError as e:
        raise TemplateError(f"{{{{{text}}}}}: {e}")
    if not args:
        raise TemplateError("empty placeholder")
    name, args = args[0], args[1:]
    if name == "include":
        if len(args) not in (1, 2) or (len(args) == 2 and args[1] != "table"):
            raise TemplateError("include FILE [table]")
        sources.append(args[0])
        body = open(_path(root, args[0])).read()
        if len(args) == 2:
            lines = body.split("\n")
            start = next((i for i, l in enumerate(lines) if l.startswith("|")), None)
            if start is None:
                raise TemplateError(f"{args[0]}: no table")
            end = start
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            return "\n".join(lines[start:end])
        return body.rstrip("\n")
    if name in ("ppl_table", "speed_table", "kv_bytes_table"):
        if len(args) != 1:
            raise TemplateError(f"{name} FILE")
        sources.append(args[0])
        return getattr(llm_tables, name)(_path(root, args[0]))
    if name == "niah_table":
        if len(args) != 1:
            raise TemplateError("niah_table GLOB")
        files = sorted(glob.glob(os.path.join(root, args[0])))
        if not files:
            raise TemplateError(f"no file matches {args[0]}")
        sources.append(args[0])
        return llm_tables.niah_table(files)
    if name == "attention_table":
        if not args:
            raise TemplateError("attention_table FILE...")
        sources.extend(args)
        return attention_table(root, args)
    if name == "attention_types_table":
        if len(args) != 1:
            raise TemplateError("attention_types_table FILE")
        sources.append(args[0])
        return attention_types_table(root, args[0])
    if name == "value":
        if len(args) not in (2, 3):
            raise TemplateError("value FILE PATH [FORMAT]")
        sources.append(args[0])
        try:
            j = json.load(open(_path(root, args[0])))
        except json.JSONDecodeError as e:
            raise TemplateError(f"{args[0]}: {e}")
        return _format(_lookup(j, args[1]), args[2] if len(args) == 3 else None)
    if name in ("values", "mean", "range", "sum"):
        if len(args) < 3:
            raise TemplateError(f"{name} FORMAT PATH FILE...")
        spec, path, files = args[0], args[1], []
        for arg in args[2:]:
            f, _, own = arg.partition("#")
            if any(c in f for c in "*?["):
                hits = [os.path.relpath(h, root) for h in sorted(glob.glob(os.path.join(root, f)))]
                if not hits:
                    raise TemplateError(f"no file matches {f}")
            else:
                hits = [f]
            files += [(h, own or path) for h in hits]
        sources.extend(f for f, _ in files)
        xs = []
        for f, fpath in files:
            try:
                xs.append(_lookup(json.load(open(_path(root, f))), fpath))
            except json.JSONDecodeError as e:
                raise TemplateError(f"{f}: {e}")
            except TemplateError as e:
                raise TemplateError(f"{f}: {e}")
        if name == "values":
            return " / ".join(_format(x, spec) for x in xs)
        if name == "mean":
            return _format(sum(xs) / len(xs), spec)
        if name == "sum":
            return _format(sum(xs), spec)
        lo, hi = _format(min(xs), spec), _format(max(xs), spec)
        return lo if lo == hi else f"{lo}-{hi}"
    raise TemplateError(f"unknown placeholder {name!r}")


def render_template(root, text, sources=None):
    sources = [] if sources is None else sources
    return PLACEHOLDER.sub(lambda m: render_placeholder(root, m.group(1).strip(), sources), text)


def templates(root):
    files = sorted(glob.glob(os.path.join(root, "bench", "benchmarks", "*.md")))
    if not files:
        raise TemplateError("no templates in bench/benchmarks/")
    return files


def generate(root=ROOT):
    parts = []
    for f in templates(root):
        try:
            parts.append(render_template(root, open(f).read()).rstrip("\n") + "\n")
        except TemplateError as e:
            raise TemplateError(f"{os.path.relpath(f, root)}: {e}")
    return "\n".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=ROOT, help="repository root (default: this script's)")
    ap.add_argument("--out", help="output file (default: ROOT/BENCHMARKS.md)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="fail if the output file differs")
    g.add_argument("--sources", action="store_true", help="list the results each template reads")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(a.root, "BENCHMARKS.md")
    try:
        if a.sources:
            for f in templates(a.root):
                src = []
                render_template(a.root, open(f).read(), src)
                print(f"{os.path.relpath(f, a.root)}: {', '.join(dict.fromkeys(src)) or 'prose'}")
            return 0
        text = generate(a.root)
    except TemplateError as e:
        print(f"make_benchmarks: {e}", file=sys.stderr)
        return 2
    if a.check:
        old = open(out).read() if os.path.exists(out) else ""
        if old == text:
            return 0
        sys.stderr.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   out, "generated", n=1))
        print(f"make_benchmarks: {out} is out of date: run python3 bench/make_benchmarks.py",
              file=sys.stderr)
        return 1
    with open(out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
