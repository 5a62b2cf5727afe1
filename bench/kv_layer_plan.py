#!/usr/bin/env python3
"""Per-layer KV cache bit allocation from measured layer sensitivities.

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
     `L...` entries are `--kv-layer-type` values).

The prediction: a layer's KLD with only that layer quantized (its sensitivity) falls by the
Lloyd-Max MSE ratio of the regular channels' bits (e.g. 3 -> 4 bits: 0.275) when upgraded, and
layers add. Upgrades only: measured layer by layer on SmolLM2-135M the downgrades cost more
than this predicts (BENCHMARKS.md, "Per-layer upgrades").
"""
import argparse
import json
import re
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
    prot = (" " + a.protect.strip()) if a.protect.strip() else ""
    ks = [f"f16{prot} L{l}:{a.k}/f16" for l in range(a.layers)]
    vs = [f"f16 L{l}:f16/{a.v}" for l in range(a.layers)]
    print(";".join(ks + vs))


def cmd_plan(a):
    try:
        d = json.load(open(a.sens))
        results = d["results"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"kv_layer_plan: cannot read the sensitivity sweep {a.sens}: {e}")
    sens = {}
    for r in results:
        try:
            lab = str(r["kv"]["label"])
            m = re.search(r"\bL(\d+):(\S+)/(\S+)", lab)
            kld = float(r["kld_mean"]) if m else None
        except (KeyError, TypeError, ValueError):
            sys.exit(f"kv_layer_plan: {a.sens}: a result without kv.label and kld_mean (run with --compare f16)")
        if not m:
            sys.exit(f"kv_layer_plan: '{lab}' is not a one-layer sensitivity config (from `kv_layer_plan.py sweep`)")
        side = "K" if m.group(3) == "f16" else "V"
        sens[(side, int(m.group(1)))] = kld
    if not sens:
        sys.exit(f"kv_layer_plan: {a.sens} holds no results")
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
    up_k = sorted(l for s, l in ch if s == "K")
    up_v = sorted(l for s, l in ch if s == "V")
    groups = {}
    for l in sorted(set(up_k) | set(up_v)):
        groups.setdefault(((a.up_k if l in up_k else bk), (a.up_v if l in up_v else bv)), []).append(l)
    label = a.base + "".join(f" L{','.join(map(str, ls))}:{tk}/{tv}" for (tk, tv), ls in groups.items())
    total = sum(sens.values())
    out = {"label": label, "bytes_per_token_added": b, "predicted_kld_saved": g,
           "sensitivity_sum": total, "up_k_layers": up_k, "up_v_layers": up_v}
    print(json.dumps(out, indent=1) if a.json else label)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="print the one-layer sensitivity --sweep string")
    s.add_argument("--layers", type=int, required=True, help="number of layers of the model")
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
    q.set_defaults(fn=cmd_plan)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
