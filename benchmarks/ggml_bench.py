#!/usr/bin/python3
"""ggml's CPU repacking with and without the cache, each load a new process of weightcache-ggml.

For a generated llama-architecture Q4_0 GGUF (weightcache-gguf-gen), per round:
  repack      ggml's stock repacking in its CPU backend's order (AMX where the CPU has it, CPU_REPACK),
              every eligible tensor into private memory
  no_repack   plain CPU buffers used in place from the mapping (llama.cpp's use_extra_bufts=false)
  cold        the cache on a fresh file: repacks into it; the load returns when every tensor is
              served and the file becomes durable (WC_DURABILITY_FULL) on a background thread
              (durable_ms: when that finished)
  cold_sync   the same, durable before the load returns (--finalize-sync --early-write-back)
  warm1       the next process, right after the cold one: verifies what it maps
  warm        a process 2.5 s later and every one after it: trusts the verification
and reports medians of the load time (GGUF opened until every tensor is ready), RssAnon after the
run, batch-64 and batch-1 throughput, with ratios measured in this run. Then four processes at
once per configuration (the cache's summed Pss against the stock loads' four private copies), and
loads from a cold page cache (the GGUF and the cache file evicted with POSIX_FADV_DONTNEED).

With --first-minute, each round also copies the GGUF to a new directory (every byte written now, as
a download does) and then, with no pause, loads it through a fresh cache file six times (a cold load
and five warm ones, each a new process, default options: no --identity-window-ms), then a stock load
of the same copy; it prints the load ms, the ratio to stock, the ratio to the warm floor (the "every
later" row of the same run) and source_bytes_hashed for each load k = 1..6 (issue 32: from k = 2 on,
at the warm floor). The four-process and cold-page-cache runs are left out then.

Run by benchmarks/run and scripts/demo; standalone:
  benchmarks/ggml_bench.py --bin build/x/examples --work build/bench/ggml [--rounds 5] [--small]
    [--layers 12 --dim 2048 --ffn 5632] [--plot PNG] [--first-minute]
Writes <work>/ggml-bench.json.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench_common import bar_plot, evict, fresh, print_gguf_first_minute, written_now

WINDOW_MS = 2000  # weightcache-ggml --identity-window-ms: the least allowed (docs/DESIGN.md, "ggml keys")
ORDER = ["repack", "no_repack", "cold", "cold_sync", "warm1", "warm"]
LABELS = {"repack": "stock ggml (repacks)", "no_repack": "no repacking (--no-repack)",
          "cold": "weightcache, cold", "cold_sync": "weightcache, cold, durable before it returns",
          "warm1": "weightcache, warm, verifies", "warm": "weightcache, warm, every later"}


def cache_cap(args, extra):
    """--max-file-mib for runs through a cache, when asked for."""
    return ["--max-file-mib", str(args.max_file_mib)] if args.max_file_mib and "--cache" in extra else []


def run(args, extra, hold=False, model=None, window_ms=WINDOW_MS, steps=None):
    cmd = args.emulator + [os.path.join(args.bin, "weightcache-ggml"), "--model", model or args.model, "--json",
                           "--steps", str(steps or args.steps), "--threads", str(args.threads)] + extra
    cmd += cache_cap(args, extra)
    if window_ms is not None:
        cmd += ["--identity-window-ms", str(window_ms)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"ggml_bench: {' '.join(cmd)} failed ({p.returncode})")
    return json.loads(p.stdout)


def one_round(args):
    cache = os.path.join(args.work, "c.wcache")
    out = {"repack": run(args, []), "no_repack": run(args, ["--no-repack"])}
    fresh(cache)
    out["cold_sync"] = run(args, ["--cache", cache, "--finalize-sync", "--early-write-back"])
    fresh(cache)
    out["cold"] = run(args, ["--cache", cache])
    out["warm1"] = run(args, ["--cache", cache])
    time.sleep(WINDOW_MS / 1000 + 0.5)
    run(args, ["--cache", cache])  # verifies again, and records it (older than the window)
    out["warm"] = run(args, ["--cache", cache])
    return out


def first_minute(args):
    """The GGUF written, then with no pause a cold load and five warm ones through a fresh cache
    (default options), then a stock load of the same copy. Each runs one short decode, so that the
    next starts soon after (a service's workers start at once)."""
    (model,), written = written_now([args.model], os.path.join(args.work, "first-minute"))
    cache = os.path.join(args.work, "first-minute", "c.wcache")
    loads, started_ms = [], []
    for _ in range(6):
        started_ms.append((time.time() - written) * 1000)
        loads.append(run(args, ["--cache", cache], model=model, window_ms=None, steps=1))
    out = {"started_ms": started_ms, "loads": loads, "repack": run(args, [], model=model, window_ms=None, steps=1)}
    shutil.rmtree(os.path.dirname(model), ignore_errors=True)
    return out


def four_at_once(args, extra):
    cmd = args.emulator + [os.path.join(args.bin, "weightcache-ggml"), "--model", args.model, "--json", "--steps", "1",
                           "--threads", "1", "--identity-window-ms", str(WINDOW_MS), "--hold-ms", "3000"] + extra
    cmd += cache_cap(args, extra)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    res = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            sys.stderr.write(e)
            raise SystemExit("ggml_bench: a four-process run failed")
        res.append(json.loads(o))
    return res


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the directory with weightcache-ggml and weightcache-gguf-gen")
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--small", action="store_true", help="2 layers of 512, one round (a smoke run)")
    ap.add_argument("--first-minute", action="store_true",
                    help="also the GGUF written, then at once a cold and five warm loads (default options)")
    ap.add_argument("--plot")
    ap.add_argument("--emulator", default="",
                    help="run the programs through this command (qemu-aarch64 for an arm64 build's --bin): "
                         "emulated times compare only as ratios within one run")
    ap.add_argument("--max-file-mib", type=int, default=0,
                    help="cap the cache file (wc_options::max_file_bytes): under qemu-user a smaller reservation "
                         "costs the emulator less bookkeeping (its default there is 8 GiB)")
    args = ap.parse_args()
    args.emulator = args.emulator.split() if args.emulator else []
    if args.small:
        args.layers, args.dim, args.ffn, args.rounds = 2, 512, 1024, 1
    os.makedirs(args.work, exist_ok=True)
    args.model = os.path.join(args.work, f"llama-{args.type}-{args.layers}x{args.dim}x{args.ffn}.gguf")
    if not os.path.exists(args.model):
        subprocess.run(args.emulator + [os.path.join(args.bin, "weightcache-gguf-gen"), "--out", args.model, "--type", args.type,
                        "--layers", str(args.layers), "--dim", str(args.dim), "--ffn", str(args.ffn)], check=True,
                       stdout=subprocess.DEVNULL)
        time.sleep(WINDOW_MS / 1000 + 0.2)  # the GGUF's identity is trusted once it is older than the window
    size_mib = os.path.getsize(args.model) / 2**20
    fm = []
    first = one_round(args)
    cpu, stock_bufts = first["repack"].get("cpu", "this CPU"), first["repack"].get("stock_buffer_types", "")
    print(f"ggml_bench: on {cpu}, ggml's CPU backend repacks this model into {stock_bufts or 'nothing'}")
    if first["repack"]["repack_tensors"] == 0 or (first["cold"]["repacked"] == 0 and first["cold"]["served_from_cache"] == 0):
        print("ggml_bench: nothing was cacheable here, because ggml's CPU backend repacks none of this model's "
              "weights into a layout the cache serves on this CPU; no cache rows on this CPU")
        with open(os.path.join(args.work, "ggml-bench.json"), "w") as f:
            json.dump({"type": args.type, "cpu": cpu, "stock_buffer_types": stock_bufts, "cacheable": False}, f, indent=1)
        return
    if args.first_minute:
        fm.append(first_minute(args))
    rounds = [first]
    for _ in range(args.rounds - 1):
        rounds.append(one_round(args))
        if args.first_minute:
            fm.append(first_minute(args))
    rows = {c: {k: med([r[c] for r in rounds], k)
                for k in ("load_ms", "durable_ms", "rss_anon_bytes", "tok_s_batch64", "tok_s_batch1")} for c in ORDER}
    sums = {c: {r[c]["checksum"] for r in rounds} for c in ORDER}
    identical = len(set().union(*(sums[c] for c in ("repack", "cold", "cold_sync", "warm1", "warm")))) == 1
    repacked_bytes = rounds[0]["cold"]["cache_rss_bytes"]

    cache = os.path.join(args.work, "c.wcache")
    if fm:
        print_gguf_first_minute(args, rows, fm, name="ggml", order=ORDER, labels=LABELS, stock="repack", width=40,
                                identity=lambda l: l["checksum"],
                                same_text="outputs of the first-minute loads bit-identical to stock's")
        return
    four_stock = four_at_once(args, [])
    four_cache = four_at_once(args, ["--cache", cache])
    four = {"stock_anon_mib": sum(r["rss_anon_bytes"] for r in four_stock) / 2**20,
            "cache_pss_mib": sum(r["cache_pss_bytes"] for r in four_cache) / 2**20,
            "cache_rss_mib": max(r["cache_rss_bytes"] for r in four_cache) / 2**20,
            "cache_private_dirty_mib": sum(r["cache_private_dirty_bytes"] for r in four_cache) / 2**20,
            "cache_anon_mib": sum(r["rss_anon_bytes"] for r in four_cache) / 2**20}

    # A cold page cache: the GGUF (and the cache file) evicted before each load.
    cold_pc = {"repack": [], "warm": []}
    for _ in range(max(1, min(3, args.rounds))):
        evict(args.model, cache)
        cold_pc["repack"].append(run(args, [])["load_ms"])
        evict(args.model, cache)
        cold_pc["warm"].append(run(args, ["--cache", cache])["load_ms"])
    cold_pc = {k: statistics.median(v) for k, v in cold_pc.items()}

    base = rows["repack"]
    print(f"ggml {args.type} on {cpu}, repacked by stock into {stock_bufts}: {args.layers} layers of {args.dim} (ffn {args.ffn}), GGUF {size_mib:.1f} MiB, "
          f"{repacked_bytes / 2**20:.1f} MiB repacked; {args.threads} threads; medians of {args.rounds} rounds, "
          "every load a new process")
    print(f"{'load':40s} {'load ms':>9s} {'vs stock':>9s} {'RssAnon MiB':>12s} {'b64 rows/s':>11s} {'b1 rows/s':>10s}")
    for c in ORDER:
        r = rows[c]
        print(f"{LABELS[c]:40s} {r['load_ms']:9.1f} {base['load_ms'] / r['load_ms']:8.1f}x {r['rss_anon_bytes'] / 2**20:12.1f} "
              f"{r['tok_s_batch64']:11.1f} {r['tok_s_batch1']:10.1f}")
    nr = rows["no_repack"]
    print(f"warm vs no-repack load: {rows['warm']['load_ms'] / nr['load_ms']:.2f}x (+{rows['warm']['load_ms'] - nr['load_ms']:.1f} ms); "
          f"warm RssAnon - no-repack's: {(rows['warm']['rss_anon_bytes'] - nr['rss_anon_bytes']) / 2**20:+.1f} MiB; "
          f"cold vs stock: {rows['cold']['load_ms'] / base['load_ms']:.2f}x (durable {rows['cold']['durable_ms']:.0f} ms after the start; "
          f"durable before returning: {rows['cold_sync']['load_ms'] / base['load_ms']:.2f}x); "
          f"warm throughput vs stock: b64 {rows['warm']['tok_s_batch64'] / base['tok_s_batch64']:.2f}x, "
          f"b1 {rows['warm']['tok_s_batch1'] / base['tok_s_batch1']:.2f}x")
    print("outputs of stock, cold and warm loads bit-identical" if identical else
          f"OUTPUTS DIFFER: {json.dumps({c: sorted(sums[c]) for c in ORDER})}")
    print(f"four processes at once: stock {four['stock_anon_mib']:.1f} MiB private (four copies); weightcache summed Pss "
          f"{four['cache_pss_mib']:.1f} MiB = {four['cache_pss_mib'] / max(four['cache_rss_mib'], 1e-9):.3f}x one copy "
          f"({four['cache_rss_mib']:.1f} MiB), Private_Dirty {four['cache_private_dirty_mib']:.1f} MiB")
    print(f"cold page cache (GGUF and cache evicted): stock {cold_pc['repack']:.1f} ms, weightcache warm {cold_pc['warm']:.1f} ms "
          f"({cold_pc['repack'] / cold_pc['warm']:.1f}x)")
    report = {"type": args.type, "layers": args.layers, "dim": args.dim, "ffn": args.ffn, "threads": args.threads,
              "rounds": args.rounds, "gguf_mib": size_mib, "cpu": cpu, "stock_buffer_types": stock_bufts, "repacked_mib": repacked_bytes / 2**20, "rows": rows,
              "identical": identical, "four": four, "cold_page_cache_ms": cold_pc}
    with open(os.path.join(args.work, "ggml-bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    if bar_plot(args.plot, f"ggml Q4_0 model load ({size_mib:.0f} MiB GGUF), each load a new process (median)",
                "ms / MiB (log scale)", [LABELS[c].replace("weightcache, ", "") for c in ORDER],
                [("load ms", [rows[c]["load_ms"] for c in ORDER]),
                 ("RssAnon MiB", [rows[c]["rss_anon_bytes"] / 2**20 for c in ORDER])], args.work):
        print(f"ggml_bench: plot in {args.plot}")

if __name__ == "__main__":
    main()
