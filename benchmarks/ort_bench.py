#!/usr/bin/python3
"""ONNX Runtime launches with and without the WeightCache execution provider, each a new process.

For each model (an f32 transformer MLP and its 4-bit MatMulNBits twin, external data) and each
round, it launches weightcache-ort-host once per configuration:
  cpu            ORT's CPU provider (prepacks every weight at session creation)
  cpu_noprepack  ORT's CPU provider with session.disable_prepacking=1: ORT's own floor
  ep_heap        the WeightCache provider without a cache file (backing=heap): packs every launch
  ep_cold        the provider on a fresh cache file: packs into it and finalizes
  ep_warm1       the next process, right after the cold one: maps the file, verifies every byte
  ep_verify      the first process launched 2.5 s later: verifies again and records that it did
                 (a file state younger than 2 s cannot be vouched for: docs/DESIGN.md)
  ep_warm        every process after it: maps and trusts that record
and reports the medians of session creation (CreateSession until ready to Run), the first Run,
and the private memory (RssAnon) a session creation added, with ratios measured in this run.
Then four processes at once per provider, to compare the memory of their weights: the CPU
provider's four private copies against the provider's one shared file (summed Pss).

With --first-minute, each round also copies each model's files to a new directory (every byte
written now, as a download does) and then, with no pause, launches a cold session on a fresh cache
file and five warm ones, each a new process, with the provider's default options (no
identity_window_ms; threads as above), then ORT's CPU provider (with and without prepacking) on the
same copy; it prints create ms, the ratio to the CPU provider and source_bytes_hashed for each
launch k = 1..6 (issue 32: from k = 2 on, >= 20x the CPU provider for f32, no source byte hashed).

Run by benchmarks/run and scripts/demo; standalone:
  benchmarks/ort_bench.py --host build/x/examples/weightcache-ort-host \
      --ep build/x/libweightcache_ort_ep.so --work build/bench/ort [--rounds 5] [--small] [--first-minute]
Writes <work>/ort-bench.json, and with --plot PNG a gnuplot chart.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import first_minute_table, written_now

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_MODELS = os.path.join(HERE, "..", "tests", "onnxruntime", "make_models.py")
# A process launched within this long of the commit it maps verifies every byte (docs/DESIGN.md,
# "Verified once per file state"); the "later" launch waits it out.
VERIFY_WINDOW_S = 2.5
ORDER = ["cpu", "cpu_noprepack", "ep_heap", "ep_cold", "ep_warm1", "ep_verify", "ep_warm"]
LABELS = {"cpu": "ORT CPU EP (prepacks)", "cpu_noprepack": "ORT CPU EP, disable_prepacking=1",
          "ep_heap": "WeightCache EP, backing=heap", "ep_cold": "WeightCache EP, cold (packs)",
          "ep_warm1": "WeightCache EP, warm, verifies", "ep_verify": "WeightCache EP, warm, 2 s on: records",
          "ep_warm": "WeightCache EP, warm, every later"}


def run_host(args, host, extra, env=None):
    cmd = [host, "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"ort_bench: {' '.join(cmd)} failed ({p.returncode})")
    return json.loads(p.stdout)


def make_models(args):
    os.makedirs(args.models, exist_ok=True)
    want = args.model_names
    manifest = os.path.join(args.models, "manifest.json")
    shape = [str(args.dim), str(args.hidden), str(args.layers)] + sorted(want)
    stamp = os.path.join(args.models, "shape.txt")
    if os.path.exists(manifest) and os.path.exists(stamp) and open(stamp).read().split() == shape:
        return
    subprocess.run(["/usr/bin/python3", MAKE_MODELS, "--out", args.models, "--big", "--dim", str(args.dim),
                    "--hidden", str(args.hidden), "--layers", str(args.layers), "--only"] + want,
                   check=True, stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        f.write(" ".join(shape))


def batch_of(model_path):
    """The CNN runs one 224x224 image per Run (the host's default batch is 2)."""
    return ["--batch", "1"] if "big_resnet" in os.path.basename(model_path) else []


def conv_of(model_path):
    """The CNN with its convolutions through the cache (conv=on; on x86-64 the default leaves them
    to the CPU provider)."""
    return ["--option", "conv=on"] if "big_resnet" in os.path.basename(model_path) else []


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def one_round(args, model_path, cache):
    # identity_window_ms=2000, the shortest allowed: the models may have been written a moment ago,
    # and by default (60 s) every session within a minute of that hashes their external data.
    ep = ["--ep", "weightcache", "--ep-library", args.ep, "--option", f"threads={args.threads}",
          "--option", "identity_window_ms=2000"] + conv_of(model_path)
    common = ["--model", model_path, "--runs", "3", "--intra-threads", str(args.threads)] + batch_of(model_path)
    out = {}
    out["cpu"] = run_host(args, args.host, common)
    out["cpu_noprepack"] = run_host(args, args.host, common + ["--session-option", "session.disable_prepacking=1"])
    out["ep_heap"] = run_host(args, args.host, common + ep + ["--option", "backing=heap"])
    for f in (cache, cache + ".lock"):
        if os.path.exists(f):
            os.unlink(f)
    withc = common + ep + ["--option", f"cache_path={cache}", "--cache-file", cache]
    out["ep_cold"] = run_host(args, args.host, withc)
    out["ep_warm1"] = run_host(args, args.host, withc)
    time.sleep(VERIFY_WINDOW_S)
    out["ep_verify"] = run_host(args, args.host, withc)
    out["ep_warm"] = run_host(args, args.host, withc)
    return out


def first_minute(args, model):
    """The model's files written, then with no pause a cold session and five warm ones (each a new
    process, the provider's default identity window), then the CPU provider on the same files."""
    sources = [os.path.join(args.models, model + ".ext.onnx"), os.path.join(args.models, model + ".ext.onnx.data")]
    copies, written = written_now(sources, os.path.join(args.work, "first-minute"))
    path, cache = copies[0], os.path.join(args.work, "first-minute", model + ".wcache")
    ep = ["--ep", "weightcache", "--ep-library", args.ep, "--option", f"threads={args.threads}",
          "--option", f"cache_path={cache}", "--cache-file", cache] + conv_of(path)
    common = ["--model", path, "--runs", "3", "--intra-threads", str(args.threads)] + batch_of(path)
    launches, started_ms = [], []
    for _ in range(6):
        started_ms.append((time.time() - written) * 1000)
        launches.append(run_host(args, args.host, common + ep))
    out = {"started_ms": started_ms, "launches": launches, "cpu": run_host(args, args.host, common),
           "cpu_noprepack": run_host(args, args.host, common + ["--session-option", "session.disable_prepacking=1"])}
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return out


def hashed(r):
    return (r.get("stats_delta") or {}).get("source_bytes_hashed", 0)


def four_at_once(args, model_path, cache, use_ep):
    """Four processes run the model at once; each measures once all four have run."""
    barrier = tempfile.mkdtemp(prefix="ort-bench-barrier-", dir=args.work)
    extra = ["--model", model_path, "--runs", "1", "--intra-threads", str(args.threads),
             "--barrier", barrier, "--processes", "4"] + batch_of(model_path)
    if use_ep:
        extra += ["--ep", "weightcache", "--ep-library", args.ep, "--option", f"cache_path={cache}",
                  "--option", "identity_window_ms=2000",
                  "--option", f"threads={args.threads}", "--cache-file", cache] + conv_of(model_path)
    procs = [subprocess.Popen([args.host, "--json"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            sys.stderr.write(e)
            raise SystemExit("ort_bench: a four-process run failed")
        results.append(json.loads(o))
    shutil.rmtree(barrier, ignore_errors=True)
    return results


def usage_of(r):
    u = r.get("cache_file_usage") or {}
    return u


def plot(args, report, order, labels):
    if not shutil.which("gnuplot"):
        print("ort_bench: no gnuplot; no plot")
        return
    dat = os.path.join(args.work, "ort-bench.dat")
    with open(dat, "w") as f:
        for c in order:
            f.write('"{}" {} {}\n'.format(labels[c].replace("WeightCache EP, ", "EP ").replace("ORT CPU EP", "CPU EP"),
                                          report["models"]["big_mlp"]["rows"][c]["create_ms"],
                                          report["models"]["big_nbits"]["rows"][c]["create_ms"]))
    gp = f"""set terminal pngcairo size 900,480 noenhanced
set output '{args.plot}'
set title 'ONNX Runtime session creation, each launch a new process (median ms, log scale)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set yrange [1:*]
set ylabel 'CreateSession (ms)'
set xtics rotate by -25 scale 0
set key top right
plot '{dat}' using 2:xtic(1) title 'f32 MLP', '' using 3 title '4-bit MatMulNBits'
"""
    subprocess.run(["gnuplot"], input=gp, text=True, check=False)
    print(f"ort_bench: plot in {args.plot}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", required=True)
    ap.add_argument("--ep", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    # Both providers get the same threads: ORT's intra-op pool and the provider's (which also creates
    # a session's layers in parallel). docs/BENCHMARKS.md quotes 1 (the table) and 2.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="a 2 x 512x1024 model, one round (a smoke run)")
    ap.add_argument("--no-memory", action="store_true", help="skip the four-process memory runs")
    ap.add_argument("--first-minute", action="store_true",
                    help="also the model written, then at once a cold and five warm sessions (default options)")
    ap.add_argument("--models", nargs="+", dest="model_names", default=["big_mlp", "big_nbits"],
                    choices=["big_mlp", "big_nbits", "big_dq", "big_mmi", "big_resnet"],
                    help="big_mlp (f32) and big_nbits (4-bit) by default; big_dq: the same MLP dynamically "
                         "quantized to int8 (DynamicQuantizeMatMul); big_mmi: the same as quantize_dynamic's "
                         "default writes it (DynamicQuantizeLinear, MatMulInteger, Cast, Mul); big_resnet: a ResNet-50-shaped f32 CNN "
                         "(224x224, batch 1)")
    ap.add_argument("--plot", help="write a PNG chart here (needs gnuplot)")
    ap.add_argument("--replot", action="store_true", help="only draw --plot from <work>/ort-bench.json")
    args = ap.parse_args()
    if args.small:
        args.dim, args.hidden, args.layers, args.rounds = 512, 1024, 2, 1
    args.ep = os.path.abspath(args.ep)
    os.makedirs(args.work, exist_ok=True)
    if args.replot:
        with open(os.path.join(args.work, "ort-bench.json")) as f:
            report = json.load(f)
        plot(args, report, ORDER, LABELS)
        return
    args.models = os.path.join(args.work, "models")
    make_models(args)

    report = {"dim": args.dim, "hidden": args.hidden, "layers": args.layers, "rounds": args.rounds,
              "threads": args.threads, "models": {}}
    names = {"big_mlp": "f32", "big_nbits": "4-bit MatMulNBits", "big_dq": "int8 DynamicQuantizeMatMul",
             "big_mmi": "int8 MatMulInteger (DynamicQuantizeLinear, Cast, Mul)",
             "big_resnet": "ResNet-50-shaped f32 CNN"}
    order, labels = ORDER, LABELS
    for model in args.model_names:
        path = os.path.join(args.models, model + ".ext.onnx")
        cache = os.path.join(args.work, model + ".wcache")
        rounds, fm = [], []
        for _ in range(args.rounds):
            rounds.append(one_round(args, path, cache))
            if args.first_minute:
                fm.append(first_minute(args, model))
        rows = {}
        for c in order:
            rs = [r[c] for r in rounds]
            rows[c] = {
                "create_ms": median([r["create_ms"] for r in rs]),
                "first_run_ms": median([r["first_run_ms"] for r in rs]),
                "run_ms": median([r["run_ms_median"] for r in rs]),
                "anon_growth_mib": median([(r["rss_anon_after"] - r["rss_anon_before"]) / 2**20 for r in rs]),
                "packed": median([(r.get("stats_delta") or {}).get("packed", 0) for r in rs]),
                "output_hash": rs[0].get("output_hash"),
            }
        cache_bytes = os.path.getsize(cache)
        m = {"rows": rows, "cache_file_bytes": cache_bytes}
        if not args.no_memory:
            cpu4 = four_at_once(args, path, cache, False)
            ep4 = four_at_once(args, path, cache, True)
            m["four_cpu_anon_mib"] = sum((r["rss_anon_after"] - r["rss_anon_before"]) / 2**20 for r in cpu4)
            m["four_ep_pss_mib"] = sum(usage_of(r).get("pss", 0) / 2**20 for r in ep4)
            m["four_ep_rss_mib"] = max(usage_of(r).get("rss", 0) / 2**20 for r in ep4)
            m["four_ep_private_dirty_mib"] = sum(usage_of(r).get("private_dirty", 0) / 2**20 for r in ep4)
            m["four_ep_anon_mib"] = sum((r["rss_anon_after"] - r["rss_anon_before"]) / 2**20 for r in ep4)
        report["models"][model] = m

        base = rows["cpu"]
        shape = ("53 convolutions and a 2048x1000 Gemm, 224x224 input, batch 1" if model == "big_resnet" else
                 f"{args.layers} layers of {args.dim}x{args.hidden} + {args.hidden}x{args.dim}")
        print(f"\n{names[model]}: {shape}, "
              f"{cache_bytes / 2**20:.1f} MiB packed, medians of {args.rounds} rounds, every launch a new process")
        print(f"{'launch':36s} {'create ms':>10s} {'vs CPU EP':>10s} {'1st run ms':>11s} {'vs CPU EP':>10s} "
              f"{'RssAnon +MiB':>13s} {'packed':>7s}")
        for c in order:
            r = rows[c]
            print(f"{labels[c]:36s} {r['create_ms']:10.2f} {base['create_ms'] / r['create_ms']:9.1f}x "
                  f"{r['first_run_ms']:11.2f} {r['first_run_ms'] / base['first_run_ms']:9.2f}x "
                  f"{r['anon_growth_mib']:13.1f} {r['packed']:7.0f}")
        cold_vs_heap = rows["ep_cold"]["create_ms"] / rows["ep_heap"]["create_ms"]
        print(f"cold vs no cache: {cold_vs_heap:.2f}x; warm later vs ORT's floor (disable_prepacking): "
              f"{rows['ep_warm']['create_ms'] / rows['cpu_noprepack']['create_ms']:.2f}x; warm RssAnon growth "
              f"{100 * rows['ep_warm']['anon_growth_mib'] / (cache_bytes / 2**20):.2f}% of the packed bytes")
        same = len({rows[c]["output_hash"] for c in ["ep_heap", "ep_cold", "ep_warm1", "ep_verify", "ep_warm"]}) == 1
        print("outputs of the five WeightCache launches " + ("bit-identical" if same else "DIFFER"))
        if "four_cpu_anon_mib" in m:
            one = cache_bytes / 2**20
            print(f"four processes at once: CPU EP {m['four_cpu_anon_mib']:.1f} MiB private (4 copies); "
                  f"WeightCache EP summed Pss {m['four_ep_pss_mib']:.1f} MiB = {m['four_ep_pss_mib'] / one:.3f}x "
                  f"one copy ({one:.1f} MiB), Private_Dirty {m['four_ep_private_dirty_mib']:.1f} MiB")
        if fm:
            cpu_ms = median([r["cpu"]["create_ms"] for r in fm])
            noprepack_ms = median([r["cpu_noprepack"]["create_ms"] for r in fm])
            print(f"\n{names[model]}, first minute: the model's files copied to a new directory, then with no pause "
                  f"(launched {max(r['started_ms'][0] for r in fm):.1f} ms after the copy was closed; the second "
                  f"{statistics.median(r['started_ms'][1] for r in fm):.0f} ms after, the last "
                  f"{statistics.median(r['started_ms'][5] for r in fm):.0f} ms after) a cold "
                  f"session and five warm ones, default identity window; medians of {args.rounds} rounds")
            m["first_minute"] = {
                "cpu_create_ms": cpu_ms, "cpu_noprepack_create_ms": noprepack_ms,
                "started_ms": [r["started_ms"] for r in fm],
                "launches": first_minute_table(
                    "create ms by launch k (each a new process); floor: the warm 'every later' row above", "create ms",
                    [[(l["create_ms"], hashed(l)) for l in r["launches"]] for r in fm], cpu_ms, "CPU EP",
                    rows["ep_warm"]["create_ms"]),
                "first_run_ms": [median([r["launches"][k]["first_run_ms"] for r in fm]) for k in range(6)],
                "from_cache": [median([(r["launches"][k].get("stats_delta") or {}).get("from_cache", 0) for r in fm])
                               for k in range(6)]}
            print(f"ORT CPU EP (prepacks), same copies: {cpu_ms:.2f} ms; disable_prepacking=1 (ORT's floor): "
                  f"{noprepack_ms:.2f} ms ({cpu_ms / noprepack_ms:.0f}x)")
            same = len({l.get("output_hash") for r in fm for l in r["launches"]} | {rows["ep_heap"]["output_hash"]}) == 1
            print("outputs of the first-minute launches " + ("bit-identical to backing=heap's" if same else "DIFFER"))

    out = os.path.join(args.work, "ort-bench.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nort_bench: JSON in {out}")
    if args.plot:
        plot(args, report, order, labels)


if __name__ == "__main__":
    main()
