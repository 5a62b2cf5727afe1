#!/usr/bin/env python3
"""Per-layer (or per-KV-head) KV cache bit allocation from measured sensitivities.

Two steps, with the project's own `tq perplexity`:

  1. `kv_layer_plan.py sweep --layers 30 --k tq3h6 --v tq4n8 --protect "s1 ck cs512 cr"`
     prints a --sweep string: for each layer l, a cache quantizing only layer l's K (then
     only layer l's V), everything else f16. Run it on calibration text that is not your
     evaluation text, e.g.
       tq perplexity -f calib.txt -c 2048 --chunks 2 --compare f16 --json \
         --sweep "$(kv_layer_plan.py sweep ...)" > sens.json
  2. `kv_layer_plan.py plan sens.json --base "tq3h6n8/tq4n8" --up-k tq4h6n8 --up-v tq5n8
     --cost-k 18 --cost-v 24 --budget 174` picks the layers whose K (V) moves to the
     upgrade type within the budget (bytes per token, all KV heads), maximizing the
     predicted KLD saved, and prints the cache label for `tq perplexity --sweep` (its
     `L...` entries are `--kv-layer-type` values); `--out FILE` also writes it as a cache
     config file that `tq --kv-config FILE` reads.

The prediction: a layer's KLD with only that layer quantized (its sensitivity) falls by the
Lloyd-Max MSE ratio of the regular channels' bits (e.g. 3 -> 4 bits: 0.275) when upgraded, and
layers add. Upgrades only: measured layer by layer on SmolLM2-135M the downgrades cost more
than this predicts (BENCHMARKS.md, "Per-layer upgrades").

`alloc` is the same idea with several types per side, cheaper ones too, and measured costs
instead of Lloyd-Max ratios (which say nothing where the regular bits stay, as in
tq2h5n8 -> tq2h6n8 or tq3n8 -> tq3h4n8):
  kv_layer_plan.py alloc sens.json --k tq2h5n8:0.0293:72.375,tq3h6n8:0.0080:96.375 \
    --v tq3n8:0.0198:75.1875,tq3h4n8:0.0120:84.375 --budget 4608 [--suffix " ks"]
Each option is TYPE:KLD:BYTES, KLD the whole-model KLD with every layer's K (V) of that type
and the other side f16, BYTES per token and layer (all KV heads); or `--types types.json`, the
`tq perplexity --json --compare f16` output of such one-side configs ("tq2h5n8/f16 ks;f16/tq3n8"),
measured on the calibration text too. Layer l's K at type t is
predicted to cost share_K(l) x KLD(t), share_K(l) the layer's fraction of the swept K
sensitivities (assumed the same at every bit width), layers add; a multiple-choice knapsack
(one type per layer and side; bytes in 1/16 units, exact for tq types, whose block headers add
1/16 or 1/8 B per token) minimizes the sum within the budget (bytes per token over all layers,
K and V).

Per KV head: `sweep --heads 3` probes each KV head of each layer alone (`L<layer>.<head>`
entries, which `--kv-layer-type` and `--sweep` labels take too); `plan` and `alloc` then work
on those units instead of whole layers (a unit's bytes: the option's bytes over the number of
units; `--cost-k/--cost-v` are per unit then).
"""
import argparse
import json
import math
import os
import re
import shlex
import sys

# Lloyd-Max MSE per coordinate of N(0, 1) at 1..8 bits.
LLOYD_MAX = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499, 6: 0.000642, 7: 0.000163, 8: 0.0000412}


def regular_bits(t):
    m = re.match(r"tq(\d)", t)
    if not m:
        sys.exit(f"kv_layer_plan: '{t}' is not a tq type (tqB, tqBn8, tqBhH[n8])")
    return int(m.group(1))


def cmd_sweep(a):
    if a.layers < 1:
        sys.exit("kv_layer_plan: --layers must be >= 1")
    if a.heads < 0:
        sys.exit("kv_layer_plan: --heads must be >= 0")
    prot = (" " + a.protect.strip()) if a.protect.strip() else ""
    units = [unit_name((l, h)) for l in range(a.layers) for h in (range(a.heads) if a.heads else [None])]
    ks = [f"f16{prot} L{u}:{a.k}/f16" for u in units]
    vs = [f"f16 L{u}:f16/{a.v}" for u in units]
    print(";".join(ks + vs))


def unit_name(u):
    """A unit (layer, head or None) as written in `--kv-layer-type`: "3" or "3.1"."""
    return str(u[0]) if u[1] is None else f"{u[0]}.{u[1]}"


def unit_json(u):
    """A unit in JSON output: the layer number, or "layer.head"."""
    return u[0] if u[1] is None else unit_name(u)


def cmd_plan(a):
    sens = read_sens(a.sens)
    bk, bv = a.base.split("/")
    fk = LLOYD_MAX[regular_bits(a.up_k)] / LLOYD_MAX[regular_bits(bk)]
    fv = LLOYD_MAX[regular_bits(a.up_v)] / LLOYD_MAX[regular_bits(bv)]
    items = [(k, s * (1 - (fk if k[0] == "K" else fv)), a.cost_k if k[0] == "K" else a.cost_v)
             for k, s in sens.items()]
    # 0/1 knapsack on whole bytes: best saving within the budget.
    best = {0: (0.0, [])}
    for key, gain, cost in sorted(items):
        for b, (g, ch) in sorted(best.items(), reverse=True):
            nb = b + cost
            if nb <= a.budget and (nb not in best or best[nb][0] < g + gain):
                best[nb] = (g + gain, ch + [key])
    b, (g, ch) = max(best.items(), key=lambda kv: kv[1][0])
    up_k = sorted(u for s, u in ch if s == "K")
    up_v = sorted(u for s, u in ch if s == "V")
    label = layer_label(a.base, {u: (a.up_k if u in up_k else bk, a.up_v if u in up_v else bv)
                                 for u in sorted(set(up_k) | set(up_v))})
    total = sum(sens.values())
    out = {"label": label, "bytes_per_token_added": b, "predicted_kld_saved": g,
           "sensitivity_sum": total, "up_k_layers": [unit_json(u) for u in up_k],
           "up_v_layers": [unit_json(u) for u in up_v]}
    emit(a, out, f"upgrades add {b} bytes per token; predicted KLD saved {g:.6g} of {total:.6g}")


def emit(a, out, summary):
    """Prints the label (or the JSON with --json); with --out also writes it as a cache config
    file for `tq --kv-config FILE`: a comment header (the command, the summary), the base types
    on the first line, one L entry per line. Written to a temporary file and renamed, so a
    failure never leaves half a file."""
    print(json.dumps(out, indent=1) if a.json else out["label"])
    if not a.out:
        return
    toks = out["label"].split()
    base = [t for t in toks if not t.startswith("L")]
    entries = [t for t in toks if t.startswith("L")]
    text = ("# KV cache config for `tq ... --kv-config FILE` (or `@FILE` in --sweep / --caches), written by\n"
            f"#   kv_layer_plan.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}\n"
            f"# {summary}\n" + " ".join(base) + "\n" + "".join(e + "\n" for e in entries))
    tmp = f"{a.out}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        sys.exit(f"kv_layer_plan: cannot write {a.out}: {e.strerror}")


def layer_label(head, types):
    """head + one ` L<units>:K/V` entry per distinct (K, V) of types {unit: (K, V)}, in the
    order the pairs first appear."""
    groups = {}
    for u, kv in types.items():
        groups.setdefault(kv, []).append(unit_name(u))
    return head + "".join(f" L{','.join(us)}:{tk}/{tv}" for (tk, tv), us in groups.items())


def read_sens(path):
    """{(side, (layer, head or None)): kld} of a one-layer or one-head sensitivity sweep
    (`sweep`'s configs)."""
    try:
        d = json.load(open(path))
        results = d["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"kv_layer_plan: cannot read the sensitivity sweep {path}: {e}")
    sens = {}
    for r in results:
        try:
            lab = str(r["kv"]["label"])
            m = re.search(r"\bL(\d+)(?:\.(\d+))?:(\S+)/(\S+)", lab)
            kld = float(r["kld_mean"]) if m else None
        except (KeyError, TypeError, ValueError):
            sys.exit(f"kv_layer_plan: {path}: a result without kv.label and kld_mean (run with --compare f16)")
        if not m:
            sys.exit(f"kv_layer_plan: '{lab}' is not a one-layer sensitivity config (from `kv_layer_plan.py sweep`)")
        unit = (int(m.group(1)), None if m.group(2) is None else int(m.group(2)))
        sens[("K" if m.group(4) == "f16" else "V", unit)] = kld
    if not sens:
        sys.exit(f"kv_layer_plan: {path} holds no results")
    if len({u[1] is None for _, u in sens}) > 1:
        sys.exit(f"kv_layer_plan: {path} mixes whole-layer and one-head probes")
    return sens


def parse_options(spec, side):
    opts = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        try:
            t, kld, b = parts[0], float(parts[1]), float(parts[2])
            if len(parts) != 3 or not t or not (math.isfinite(kld) and kld >= 0 and math.isfinite(b) and b > 0):
                raise ValueError
        except (ValueError, IndexError):
            sys.exit(f"kv_layer_plan: --{side.lower()} option '{item}' is not TYPE:KLD:BYTES (KLD >= 0, BYTES > 0)")
        opts.append((t, kld, b))
    if len({t for t, _, _ in opts}) != len(opts):
        sys.exit(f"kv_layer_plan: --{side.lower()} lists a type twice")
    return opts


def read_results(paths):
    """(path, result) of every result in the type-cost files."""
    out = []
    for path in paths:
        try:
            d = json.load(open(path))
            out += [(path, r) for r in d["results"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"kv_layer_plan: cannot read the type costs {path}: {e}")
    return out


def read_types(paths, n_units):
    """K and V options from `tq perplexity --json --compare f16` of one-side configs: a result
    labelled "T/f16 ..." is K option T, "f16/T ..." V option T; bytes per layer from its
    kv_bytes_per_token minus the f16 side's half of kv_bytes_per_token_f16, over n_units (the
    sensitivity sweep's layers or KV heads)."""
    opts = {"K": [], "V": []}
    for path, r in read_results(paths):
        try:
            lab = str(r["kv"]["label"])
            kld, b, b16 = float(r["kld_mean"]), float(r["kv_bytes_per_token"]), float(r["kv_bytes_per_token_f16"])
            if not (math.isfinite(kld) and kld >= 0 and math.isfinite(b) and math.isfinite(b16) and b > b16 / 2):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            sys.exit(f"kv_layer_plan: {path}: a result without a valid kv.label, kld_mean and kv_bytes_per_token")
        tk, _, tv = lab.split()[0].partition("/")
        if re.search(r"\bL\d", lab) or (tk == "f16") == (tv == "f16") or not tv:
            sys.exit(f"kv_layer_plan: {path}: '{lab}' is not a one-side config (T/f16 or f16/T, no L entries)")
        side, t = ("K", tk) if tv == "f16" else ("V", tv)
        if any(o[0] == t for o in opts[side]):
            sys.exit(f"kv_layer_plan: {side} type {t} appears twice in the type costs")
        opts[side].append((t, kld, (b - b16 / 2) / n_units))
    for side in ("K", "V"):
        if not opts[side]:
            form = "T/f16" if side == "K" else "f16/T"
            sys.exit(f"kv_layer_plan: {', '.join(paths)}: no {side} option ({form} configs)")
    return opts


def cmd_alloc(a):
    sens = read_sens(a.sens)
    if not (math.isfinite(a.budget) and a.budget >= 0):
        sys.exit(f"kv_layer_plan: --budget {a.budget} is not a byte count >= 0")
    if a.types and (a.k or a.v) or not a.types and not (a.k and a.v):
        sys.exit("kv_layer_plan: alloc takes --types FILE, or --k and --v")
    units = sorted({u for _, u in sens})  # layers (l, None) or KV heads (l, h)
    if a.types:
        opts = read_types(a.types, len(units))
    else:
        opts = {"K": parse_options(a.k, "K"), "V": parse_options(a.v, "V")}
    groups = []  # (side, unit, [(type, predicted kld, cost in 1/16 bytes)], cheapest cost)
    for side in ("K", "V"):
        tot = sum(v for (s_, _), v in sens.items() if s_ == side)
        for u in units:
            if (side, u) not in sens:
                sys.exit(f"kv_layer_plan: {a.sens} has no {side} probe of L{unit_name(u)}")
            share = sens[(side, u)] / tot if tot > 0 else 1.0 / len(units)
            og = [(t, share * kld, math.ceil(b * 16 - 1e-9)) for t, kld, b in opts[side]]
            groups.append((side, u, og, min(c for _, _, c in og)))
    base = sum(g[3] for g in groups)
    cap = math.floor(a.budget * 16 + 1e-9) - base
    if cap < 0:
        sys.exit(f"kv_layer_plan: the budget {a.budget} B/token is below the cheapest allocation "
                 f"({base / 16:g} B/token)")
    # Multiple-choice knapsack over the extra cost above each group's cheapest option.
    INF = float("inf")
    best = [0.0] + [INF] * cap  # best[c]: least predicted KLD of the groups so far at extra cost c
    picks = []
    for _, _, og, cmin in groups:
        nb = [INF] * (cap + 1)
        pk = [-1] * (cap + 1)
        for i, (_, kld, c) in enumerate(og):
            e = c - cmin
            for x in range(cap - e, -1, -1):
                v = best[x] + kld
                if v < nb[x + e]:
                    nb[x + e], pk[x + e] = v, i
        best = nb
        picks.append(pk)
    x = min(range(cap + 1), key=lambda i: (best[i], i))
    pred = best[x]
    choice, cost = {}, 0
    for gi in range(len(groups) - 1, -1, -1):
        side, u, og, cmin = groups[gi]
        t, _, c = og[picks[gi][x]]
        choice[(side, u)] = t
        cost += c
        x -= c - cmin
    cost /= 16
    bk = max(opts["K"], key=lambda o: (sum(choice[("K", u)] == o[0] for u in units), -o[2]))[0]
    bv = max(opts["V"], key=lambda o: (sum(choice[("V", u)] == o[0] for u in units), -o[2]))[0]
    per_unit = {u: (choice[("K", u)], choice[("V", u)]) for u in units}
    label = layer_label(f"{bk}/{bv}{a.suffix}", {u: kv for u, kv in per_unit.items() if kv != (bk, bv)})
    out = {"label": label, "bytes_per_token": cost, "predicted_kld": pred, "units": [unit_json(u) for u in units],
           "k_types": [choice[("K", u)] for u in units], "v_types": [choice[("V", u)] for u in units]}
    emit(a, out, f"{cost:g} bytes per token (K and V of every layer, sink and means not counted); "
                 f"predicted KLD {pred:.6g}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="print the one-layer sensitivity --sweep string")
    s.add_argument("--layers", type=int, required=True, help="number of layers of the model")
    s.add_argument("--heads", type=int, default=0, help="KV heads per layer: probe each head alone (default 0: whole layers)")
    s.add_argument("--k", required=True, help="K type to probe (e.g. tq3h6)")
    s.add_argument("--v", required=True, help="V type to probe (e.g. tq4n8)")
    s.add_argument("--protect", default="s1 ck cs512 cr", help="protection of the K probes (f16 K gets none automatically)")
    s.set_defaults(fn=cmd_sweep)
    q = sub.add_parser("plan", help="choose the layers to upgrade")
    q.add_argument("sens", help="JSON of `tq perplexity --json --compare f16 --sweep <sweep string>`")
    q.add_argument("--base", required=True, help="base K/V types, e.g. tq3h6n8/tq4n8")
    q.add_argument("--up-k", required=True, help="K upgrade type, e.g. tq4h6n8")
    q.add_argument("--up-v", required=True, help="V upgrade type, e.g. tq5n8")
    q.add_argument("--cost-k", type=int, required=True, help="bytes per token an upgraded K layer adds (all KV heads)")
    q.add_argument("--cost-v", type=int, required=True, help="bytes per token an upgraded V layer adds (all KV heads)")
    q.add_argument("--budget", type=int, required=True, help="bytes per token to spend")
    q.add_argument("--json", action="store_true", help="print the plan as JSON")
    q.add_argument("--out", help="also write the label as a cache config file (tq --kv-config FILE)")
    q.set_defaults(fn=cmd_plan)
    c = sub.add_parser("alloc", help="one type per layer and side from measured whole-model costs")
    c.add_argument("sens", help="JSON of the one-layer sensitivity sweep (as for plan)")
    c.add_argument("--types", action="append", help="JSON of `tq perplexity --json --compare f16` over one-side "
                   "configs (T/f16, f16/T): the options with their KLD and bytes (repeatable)")
    c.add_argument("--k", help="instead of --types: K options TYPE:KLD:BYTES,... (see kv_layer_plan.py --help)")
    c.add_argument("--v", help="instead of --types: V options TYPE:KLD:BYTES,...")
    c.add_argument("--budget", type=float, required=True, help="bytes per token over all layers, K and V")
    c.add_argument("--suffix", default="", help="appended to the base K/V of the label, e.g. ' ks'")
    c.add_argument("--json", action="store_true", help="print the allocation as JSON")
    c.add_argument("--out", help="also write the label as a cache config file (tq --kv-config FILE)")
    c.set_defaults(fn=cmd_alloc)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
