#!/usr/bin/env python3
"""Saved model-speed results and what BENCHMARKS.md, README.md and docs/results.md say of them:
the decode-kernel A/Bs (bench/results/qmatvec_f16c/, qmatvec_prefetch_avx2/ and the
decode_prefetch_* runs of bench/results/gemma/) and Gemma 3 270M beside llama.cpp with both
engines at AVX2 (gemma/speed_vs_llama_cpp_avx2_xeon*); SmolLM2's recommended caches beside f16
(bench/results/speed_recommended/); the trellis encoder's A/B (bench/results/trellis_encode/)."""
import json
import os
import statistics

from bench_results_lib import RES, ROOT, check, finish, load, spread, summarize_module

# The decode kernels' fp16 scale A/B (71-weight-formats.md "fp16 block scales with F16C", design.md): summary.json is
# summarize.py's; the Q8_0 kernel takes 0.74-0.76x the time ("a third more" before).
qsum = summarize_module("qmatvec_f16c")
qs = load("qmatvec_f16c/summary.json")
check(qs == json.loads(json.dumps(qsum.summarize())), "qmatvec_f16c/summary.json is summarize.py's output")
spread([qs["Q8_0_640x2048"]["ratio"], qs["Q8_0_2048x640"]["ratio"]], 0.74, 0.76, "qmatvec_f16c: Q8_0", digits=2)

# The same for the Highway decode kernels' weight prefetch (71-weight-formats.md "Weight prefetch
# in the AVX2 / SSE4 decode kernels"): summary.json is summarize.py's; the kernels take about
# 0.57-0.76x the time; whole decode 1.3x or more as fast, prefill unchanged within the runs'
# noise and order (0.9-1.1x); the order check (a build against itself) near 1; the AVX2 kernels
# within 10% of the AVX-512 ones.
psum = summarize_module("qmatvec_prefetch_avx2")
ps = load("qmatvec_prefetch_avx2/summary.json")
check(ps == json.loads(json.dumps(psum.summarize())), "qmatvec_prefetch_avx2/summary.json is summarize.py's output")
check(all(0.55 <= ps[k]["ratio"] <= 0.77 for k in ("GemmaStack_t1", "GemmaStack_t2", "GemmaHead_t1", "GemmaHead_t2")),
      "qmatvec_prefetch_avx2: kernels 0.55-0.77x the time")
check(ps["GemmaStack_t1"]["old_ms"] > 1.8 * ps["avx2_vs_avx3_dl"]["GemmaStack_t1"]["avx3dl_ms"],
      "qmatvec_prefetch_avx2: before, about twice the AVX-512 kernels' time")
check(all(0.9 <= ps["avx2_vs_avx3_dl"][k]["ratio"] <= 1.0 for k in ("GemmaStack_t1", "GemmaStack_t2")),
      "qmatvec_prefetch_avx2: after, avx2 within 10% of avx3_dl")
fk = ps["float_kernels_avx3_dl"]
check(len(fk) == 9 and all(0.95 <= v["ratio"] <= 1.05 for k, v in fk.items() if k.split("_")[0] in ("F32", "Q5")) and
      all(0.75 <= v["ratio"] <= 0.8 for k, v in fk.items() if k.split("_")[0] in ("F16", "BF16")),
      "qmatvec_prefetch_avx2: float kernels at avx3_dl no slower, F16 / BF16 faster")
for f in ("decode_prefetch_avx2_t1", "decode_prefetch_avx2_t2", "decode_prefetch_sse4_t1",
          "decode_prefetch_avx2_smollm2_t2"):
    r = load(f"gemma/{f}.json")["ratios"][0]
    check(r["decode_ratio_min"] > 1.3 and 0.9 < r["prefill_ratio_median"] < 1.1, f"{f}: decode >= 1.3x, prefill ~1 ({r})")
rr = load("gemma/decode_prefetch_avx2_smollm2_t2_reversed.json")["ratios"][0]
check(rr["decode_ratio_max"] < 1 / 1.3 and 0.95 < rr["prefill_ratio_median"] < 1.05, f"reversed order ({rr})")
aa = load("gemma/decode_ab_order_aa_smollm2_t2.json")["ratios"][0]
check(0.95 < aa["prefill_ratio_median"] < 1.05 and 0.95 < aa["decode_ratio_median"] < 1.05, f"A/A ({aa})")

# Gemma 3 270M beside llama.cpp with both engines at AVX2 (73-architectures.md, README, results.md):
# the two saved runs and the first run's printed lines; each engine at AVX2 only.
runs = {}
for f in ("speed_vs_llama_cpp_avx2_xeon", "speed_vs_llama_cpp_avx2_xeon_run3"):
    j = load(f"gemma/{f}.json")
    check("AVX512" not in j["llama_cpp_system_info"] and "AVX2 = 1" in j["llama_cpp_system_info"] and
          j["tq_env"] == {"TQ_SIMD": "avx2", "OPENBLAS_CORETYPE": "Haswell"}, f"{f}: both engines at AVX2")
    for r in j["speed_ratio"]:
        runs.setdefault(r["context"], []).append((r["prefill_ratio_median"], r["decode_ratio_median"]))
with open(os.path.join(RES, "gemma", "speed_vs_llama_cpp_avx2_xeon_first_run.log")) as f:
    for line in f:
        if line.startswith("tq / llama.cpp ctx"):
            w = line.split()
            runs.setdefault(int(w[4]), []).append((float(w[7].rstrip("x,")), float(w[9].rstrip("x"))))
for ctx, pf, dc in ((512, (1.34, 1.39), (1.31, 1.55)), (4096, (1.21, 1.22), (1.39, 1.71))):
    rs = runs.get(ctx, [])
    check(len(rs) == 3, f"avx2 llama.cpp: three runs at {ctx}")
    spread([p for p, _ in rs], pf[0], pf[1], f"avx2 llama.cpp: prefill at {ctx}", digits=2)
    spread([d for _, d in rs], dc[0], dc[1], f"avx2 llama.cpp: decode at {ctx}", digits=2)

# SmolLM2's recommended caches beside f16 (50-model-speed.md "Speed of the recommended caches",
# 60-model-recommended.md, docs/results.md): three rounds of run.sh, each a lut8 process (f16, the
# 4.25-bit file, auto) and a float one (f16, auto) at 512 / 4096 / 8192, 2 threads; table.md is
# summarize.py's; the prose's medians and docs/results.md's medians and ranges follow from the runs.
srec = summarize_module("speed_recommended")
check(open(os.path.join(RES, "speed_recommended", "table.md")).read() == srec.table(),
      "speed_recommended/table.md is summarize.py's")
CACHES = {"lut8": ["f16", "@configs/smollm2-135m-kv4.25.kv", "auto"], "float": ["f16", "auto"]}
rec = {}
for kind, caches in CACHES.items():
    rs = srec.rounds(kind)  # the runs summarize.py reads
    check(len(rs) == 3, f"speed_recommended: three {kind} rounds")
    for j in rs:
        check(j["threads"] == 2 and j["attention"] == ("lut8" if kind == "lut8" else "fused"),
              f"speed_recommended {kind}: 2 threads, kernel {j['attention']}")
        check([(r["context"], r["cache"]) for r in j["rows"]] == [(c, k) for c in (512, 4096, 8192) for k in caches],
              f"speed_recommended {kind}: contexts and caches")
        check(all(r["decode_tokens"] == 32 for r in j["rows"]), f"speed_recommended {kind}: 32 decode steps")
    for i, row in enumerate(rs[0]["rows"]):
        rec[(kind, row["context"], row["cache"])] = {k: sorted(j["rows"][i][k] for j in rs)
                                                    for k in ("prefill_vs_first", "decode_vs_first")}
kv4, auto = "@configs/smollm2-135m-kv4.25.kv", "auto"
bm = open(os.path.join(ROOT, "BENCHMARKS.md")).read()
results_md = open(os.path.join(ROOT, "docs", "results.md")).read()
med = lambda xs: f"{xs[1]:.2f}"  # noqa: E731
rng = lambda xs: f"{xs[0]:.2f}-{xs[2]:.2f}"  # noqa: E731
check(f"the 4.25-bit file {med(rec[('lut8', 4096, kv4)]['decode_vs_first'])}x and `auto` "
      f"{med(rec[('lut8', 4096, auto)]['decode_vs_first'])}x at 4K, {med(rec[('lut8', 8192, kv4)]['decode_vs_first'])}x and "
      f"{med(rec[('lut8', 8192, auto)]['decode_vs_first'])}x at 8K" in " ".join(bm.split()),
      "50-model-speed.md: the lut8 decode medians at 4K and 8K")
check(all(r["decode_vs_first"][1] > 1 for k, r in rec.items() if k[0] == "lut8" and k[1] >= 4096 and k[2] != "f16"),
      "speed_recommended: both tq caches decode faster than f16 from 4K on with lut8 (medians)")
for cache, label in ((kv4, "4.25-bit per-head allocation, `--attn-lut8`"), (auto, "`auto` (tq3h6 / tq4n8, protected), `--attn-lut8`")):
    for key, what in (("prefill_vs_first", ": prefill"), ("decode_vs_first", None)):
        cells = " | ".join(f"{med(rec[('lut8', c, cache)][key])}x ({rng(rec[('lut8', c, cache)][key])})" for c in (512, 4096, 8192))
        row = f"| {label}{what} | {cells} |" if what else f"| the same: decode | {cells} |"
        check(row in results_md, f"docs/results.md: {row}")

# The trellis encoder's A/B (10-codec.md "Trellis encoder", design.md): table.md is summarize.py's;
# three rounds a level; the text's "about 0.6x" at 4 bits, 0.67-0.87x at 3 bits (medians over the
# rounds, every dim and both levels), AVX-512 at 2 bits unchanged; the whole-model 1-thread A/B
# faster in each of its 5 rounds.
tsum = summarize_module("trellis_encode")
check(open(os.path.join(RES, "trellis_encode", "table.md")).read() == tsum.table(), "trellis_encode/table.md is summarize.py's")
tmed = {}
for level in ("avx512", "avx2"):
    check(len(tsum.rounds(level)) == 3, f"trellis_encode: three {level} rounds")
    for (dim, bits), (rr, _, _) in tsum.ratios(level).items():
        tmed[(level, dim, bits)] = sorted(rr)[1]
four = [v for (lv, d, b), v in tmed.items() if b == 4]
check(all(0.55 <= v <= 0.7 for v in four), f"trellis_encode: 4 bits about 0.6x ({four})")
spread([v for (lv, d, b), v in tmed.items() if b == 3], 0.67, 0.87, "trellis_encode: 3 bits", digits=2)
check(all(0.9 <= v <= 1.1 for (lv, d, b), v in tmed.items() if b == 2 and lv == "avx512"), "trellis_encode: 2 bits at AVX-512 unchanged")
vt = load("gemma/ab_viterbi_c2k_t1.json")["ratios"][0]
check(vt["rounds"] == 5 and vt["prefill_ratio_min"] > 1.0 and vt["cache"] == "@configs/gemma3-270m-kv4.25.kv",
      f"ab_viterbi_c2k_t1: prefill faster in each of 5 rounds ({vt})")

# Gemma 3 270M beside llama.cpp on the AVX-512 host (73-architectures.md "Gemma 3 270M speed beside
# llama.cpp", README, results.md): 5 rounds, 2 threads, f16 caches; tq faster in every round, as the
# text says; the medians README and results.md quote.
vl = load("gemma/speed_vs_llama_cpp.json")
vr = {r["context"]: r for r in vl["speed_ratio"]}
check(sorted(vr) == [512, 4096] and all(r["rounds"] == 5 and r["cache"] == "f16" for r in vr.values()) and
      all(s_["threads"] == 2 for s_ in vl["speed"]), "speed_vs_llama_cpp: 5 rounds at 512 and 4096, f16, 2 threads")
check(all(x > 1 for r in vr.values() for x in r["prefill_ratio"] + r["decode_ratio"]),
      "speed_vs_llama_cpp: tq faster in every round")
vp = f"{vr[512]['prefill_ratio_median']:.2f}x / {vr[4096]['prefill_ratio_median']:.2f}x"
vd = f"{vr[512]['decode_ratio_median']:.2f}x / {vr[4096]['decode_ratio_median']:.2f}x"
check(f"AVX-512 host: prefill {vp}, decode {vd};" in open(os.path.join(ROOT, "README.md")).read() and
      f"tq decodes {vd} as fast as llama.cpp at ctx 512 / 4096 and prefills {vp}" in " ".join(results_md.split()),
      "README / results.md: the llama.cpp comparison's medians")

# The shared RoPE-mean angles' A/B (50-model-speed.md "RoPE-rotating K mean: a prefill call turns
# its blocks' angles once", design.md): medians of the rounds' medians, as attn_cpu_ab.sh prints them.
ra = [json.loads(x) for x in open(os.path.join(RES, "gemma/rope_angles/attn_cpu_ab.jsonl"))]
check(sorted({r["round"] for r in ra}) == [1, 2, 3, 4, 5] and all(r["result"]["threads"] == 1 for r in ra),
      "rope_angles: 5 rounds, 1 thread")


def ra_ms(lib, spec, ctx, kernel, window, q=128):
    v = [r["result"]["cpu_ms_median"] for r in ra if r["library"] == lib and r["result"]["spec"].startswith(spec) and
         r["result"]["context"] == ctx and r["result"]["kernel"] == kernel and r["result"]["sliding_window"] == window and
         r["result"]["queries"] == q and r["result"].get("flush_mb", 0) == 0]
    return statistics.median(v)


bench_md = open(os.path.join(ROOT, "bench", "benchmarks", "50-model-speed.md")).read()
for call, ctx, window, cols in (("windowed (512 tokens), context 16K", 16384, 512, ("lut8", "fused")),
                                ("global, context 4K", 4096, 0, ("lut8",)), ("global, context 32K", 32768, 0, ("lut8",))):
    fmt = ".2f" if ctx < 32768 else ".1f"
    cells = []
    for k in ("lut8", "fused"):
        cells += [f"{ra_ms(lib, 'k=tq4h6n8', ctx, k, window):{fmt}} ms" if k in cols else "" for lib in ("before", "after")]
    f16 = " / ".join(f"{ra_ms(lib, 'f16', ctx, 'fused', window):{fmt}}" for lib in ("before", "after"))
    row = "|" + "|".join(f" {c} " if c else " " for c in [call, *cells, f"{f16} ms"]) + "|"
    check(row in bench_md, f"50-model-speed.md rope angles row: {row}")
    check(ra_ms("after", "k=tq4h6n8", ctx, "lut8", window) < ra_ms("before", "k=tq4h6n8", ctx, "lut8", window),
          f"rope_angles: lut8 faster at {call}")

# Gemma 3 270M at 4K / 16K / 32K with the current build (74-gemma-caches.md "Speed at 4K, 16K and
# 32K with the current build", README, docs/results.md): five runs of f16, auto and the 4.25-bit
# file at 2 threads, 3 repetitions kept; what the text says of the goals (prefill >= 0.9x
# at every context in the three quiet runs, 3-5, missed at 4K in the two loaded ones and at 16K in
# the second; decode >= 1.3x at 32K in runs 2-4, missed in 1 and 5); the third run the quietest of
# the Xeon three; the ctx-64 decode the text's bound comes from; the figures README and results.md quote.
runs = [load(f"gemma/speed_long_current{x}.json") for x in ("", "_r2", "_r3", "_r4", "_r5")]
for i, gl in enumerate(runs):
    what = f"speed_long_current run {i + 1}"
    check(gl["threads"] == 2 and gl["attention"] == "lut8" and "load_average_1min" in gl, f"{what}: 2 threads, lut8, load")
    check([(r["context"], r["cache"]) for r in gl["rows"]] ==
          [(c, k) for c in (4095, 16383, 32767) for k in ("f16", "auto", "@configs/gemma3-270m-kv4.25.kv")],
          f"{what}: contexts and caches")
    check(all(len(r["prefill_tok_s_each"]) == 3 and r["decode_tokens"] == 32 for r in gl["rows"]), f"{what}: 3 reps, 32 steps")
gs = [{(r["context"], r["cache"]): r for r in gl["rows"]} for gl in runs]
ga = [[g[(c, "auto")] for g in gs] for c in (4095, 16383, 32767)]  # auto's rows [context][run]
pf = [[r["prefill_vs_first"] for r in a] for a in ga]
dc = [[r["decode_vs_first"] for r in a] for a in ga]
check([p_ >= 0.9 for p_ in pf[0]] == [False, False, True, True, True] and
      [p_ >= 0.9 for p_ in pf[1]] == [True, False, True, True, True] and
      all(p_ >= 0.9 for p_ in pf[2]) and [d >= 1.3 for d in dc[2]] == [False, True, True, True, False] and
      runs[2]["rows"][0]["prefill_tok_s"] > max(runs[0]["rows"][0]["prefill_tok_s"], runs[1]["rows"][0]["prefill_tok_s"]),
      "speed_long_current: auto's goals as 74-gemma-caches.md states them, the third run the quietest of the first three")
c64 = load("gemma/decode_c64.json")
check(c64["threads"] == 2 and [r["cache"] for r in c64["rows"]] == ["f16", "auto"] and c64["rows"][0]["context"] == 64,
      "decode_c64: f16 and auto at context 64, 2 threads")
step = lambda r: 1000.0 / r["decode_tok_s"]  # noqa: E731  ms a decode step
f32k, a32k, f64 = gs[4][(32767, "f16")], gs[4][(32767, "auto")], c64["rows"][0]
check(abs(step(f32k) / step(f64) - 1.57) < 0.005 and abs(step(f32k) - step(f64) - 6.7) < 0.05 and
      abs(step(a32k) - step(f64) - 2.6) < 0.05, "74-gemma-caches.md: the 32K decode bound (1.57x, 6.7 and 2.6 ms)")
f4 = gs[0][(4095, "@configs/gemma3-270m-kv4.25.kv")]
j = lambda xs, fmt=".2f": " / ".join(format(x, fmt) for x in xs)  # noqa: E731
readme = open(os.path.join(ROOT, "README.md")).read()
f4s = sorted(g[(4095, "@configs/gemma3-270m-kv4.25.kv")]["prefill_vs_first"] for g in gs)
check(f"the current build in five runs on two hosts, the first two loaded: {j(dc[2])}x) and prefills {j(pf[2])}x "
      f"({j(pf[0], '.3f')}x at 4K: the 0.9x goal met in the three quiet runs)" in readme and
      f"prefills slower ({f4s[0]:.2f}-{f4s[-1]:.2f}x f16 at 4K)" in readme, "README: the current Gemma 32K figures")
check(f"with the current build in five runs on two hosts, the first two loaded, {j(dc[2])}x, {j(dc[1])}x at 16K"
      in " ".join(results_md.split()) and
      f"is {j(pf[2])}x f16's at 32K, {j(pf[1])}x at 16K and {j(pf[0], '.3f')}x at 4K" in " ".join(results_md.split()) and
      f"({f4['prefill_vs_first']:.2f}x f16 at 4K, {gs[0][(16383, '@configs/gemma3-270m-kv4.25.kv')]['prefill_vs_first']:.2f}x at 16K"
      in " ".join(results_md.split()), "docs/results.md: the current Gemma figures")

# Gemma's caches on the lookup-table kernel (74-gemma-caches.md "With the lookup-table kernel",
# README): the file within +1%, auto's deltas as README quotes them, the float kernel's f16.
lut = {c: load(f"gemma/rope/ppl_c{c}_rope_lut8.json") for c in (512, 2048)}
flt = {c: load(f"gemma/rope/ppl_c{c}_rope.json") for c in (512, 2048)}
check(all(lut[c]["results"][0]["ppl_f16"] == flt[c]["results"][0]["ppl_f16"] for c in lut), "rope lut8: the same f16 as the float runs")
d = {c: [r["ppl_delta_pct"] for r in lut[c]["results"]] for c in lut}
check(all(d[c][1] < 1.0 and d[c][2] < 3.0 for c in d), f"rope lut8: the files within +1% / +3% ({d})")
# The float kernel's figure: the trellis-cost command re-run with the f16 kernel of the current build.
tc = load("gemma/f16_multiquery/speed_c4095_kv425_fit512_vs_trellis.json")
check(tc["attention"] == "fused" and tc["threads"] == 2 and
      [r["cache"] for r in tc["rows"]] == ["f16", "@bench/results/gemma/gemma3-270m-kv4.25-fit512.kv",
                                           "@configs/gemma3-270m-kv4.25.kv"], "trellis cost, current build: float kernel, 3 caches")
check(f"(+{d[512][0]:.2f}% / +{d[2048][0]:.2f}% with `--attn-lut8`)" in readme and
      f"`--attn-lut8` on AVX-512 VNNI: +{d[512][1]:.2f}% / +{d[2048][1]:.2f}%; its prefill at 4K is {f4['prefill_vs_first']:.2f}x f16's, "
      f"{tc['rows'][2]['prefill_vs_first']:.2f}x on the default kernel)" in readme and
      f"({tc['rows'][2]['prefill_vs_first']:.2f}x f16 at 4K against {tc['rows'][1]['prefill_vs_first']:.2f}x with scalar codes"
      in " ".join(results_md.split()), "README and docs/results.md: the Gemma lut8 and float-kernel figures")

finish("model bench results")
