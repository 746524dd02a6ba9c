"""What the benchmark scripts share: evicting files from the page cache, removing a cache file,
writing a model's files afresh, a per-launch table of the "first minute" runs, and a clustered bar
chart through gnuplot (nothing when gnuplot is missing)."""
import json
import os
import shutil
import statistics
import subprocess
import time


def evict(*paths):
    """Drops the files' pages from the page cache (written back first), for cold-page-cache loads."""
    for path in paths:
        if os.path.exists(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fresh(cache):
    """Removes a cache file and its lock file: the next load is a cold one."""
    for f in (cache, cache + ".lock"):
        if os.path.exists(f):
            os.unlink(f)


def written_now(sources, directory):
    """Copies the files into a fresh directory, every byte written now (their change times are this
    moment's), as a download does just before a service's workers start. Returns the copies' paths
    and the moment the last one was closed (time.time())."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    copies = []
    for src in sources:
        dst = os.path.join(directory, os.path.basename(src))
        shutil.copyfile(src, dst)
        copies.append(dst)
    return copies, time.time()


def first_minute_table(what, unit, launches, base_ms, base_label, floor_ms=None):
    """Prints the "first minute" launches k = 1..6 of every round (launches: one list of
    (ms, source_bytes_hashed) per round), each against the baseline's median (base_ms) and, when
    given, the warm floor measured in the same run (the column "/ floor": 1.00 is at the floor).
    Returns the rows for the JSON."""
    rows = []
    head = f"{'k':>2s} {'':22s} {unit + ' median':>11s} {'range':>15s} {'vs ' + base_label:>14s}"
    if floor_ms:
        head += f" {'/ floor':>8s}"
    print(f"{what}\n{head} {'source bytes hashed (max of rounds)':>36s}")
    for k in range(len(launches[0])):
        ms = [r[k][0] for r in launches]
        hashed = [r[k][1] for r in launches]
        m = statistics.median(ms)
        row = {"k": k + 1, "ms": m, "min_ms": min(ms), "max_ms": max(ms), "vs_base": base_ms / m,
               "source_bytes_hashed_max": max(hashed), "source_bytes_hashed_min": min(hashed)}
        line = (f"{k + 1:2d} {'(packs)' if k == 0 else '':22s} {m:11.2f} {min(ms):7.2f}-{max(ms):7.2f} "
                f"{base_ms / m:13.1f}x")
        if floor_ms:
            row["vs_floor"] = m / floor_ms
            line += f" {m / floor_ms:8.2f}"
        print(f"{line} {max(hashed):36,d}")
        rows.append(row)
    return rows


def bar_plot(png, title, ylabel, labels, series, work):
    """series: [(title, [value per label])]; a log-scale histogram of them into png. False without gnuplot."""
    if not png or not shutil.which("gnuplot"):
        return False
    dat = os.path.join(work, os.path.splitext(os.path.basename(png))[0] + ".dat")
    with open(dat, "w") as f:
        for i, label in enumerate(labels):
            f.write('"{}" {}\n'.format(label, " ".join(str(s[1][i]) for s in series)))
    plots = [f"'{dat}' using 2:xtic(1) title '{series[0][0]}'"]
    plots += [f"'' using {k + 2} title '{series[k][0]}'" for k in range(1, len(series))]
    gp = f"""set terminal pngcairo size 900,480 noenhanced
set output '{png}'
set title '{title}'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set yrange [0.5:*]
set ylabel '{ylabel}'
set xtics rotate by -20 scale 0
set key top right
plot {", ".join(plots)}
"""
    subprocess.run(["gnuplot"], input=gp, text=True, check=True)
    return True


def print_gguf_first_minute(args, rows, fm, *, name, order, labels, stock, width, identity, same_text):
    """The first-minute report of a GGUF runtime (ggml_bench.py, llama_bench.py): the rows of the
    usual scenario (stock, row `stock`, and the warm floor, row "warm", come from them), then the
    first minute's loads by k; `identity(load)` is what must be equal across every load for the
    outputs to be bit-identical. JSON in <work>/<name>-first-minute.json."""
    base = rows[stock]
    print(f"{'load':{width}s} {'load ms':>9s} {'vs stock':>9s}")
    for c in order:
        print(f"{labels[c]:{width}s} {rows[c]['load_ms']:9.1f} {base['load_ms'] / rows[c]['load_ms']:8.1f}x")
    stock_ms = statistics.median(r[stock]["load_ms"] for r in fm)
    floor_ms = rows["warm"]["load_ms"]
    keep = ("load_ms", "source_bytes_hashed", "served_from_cache", "repacked", "durable_ms")
    print(f"\nfirst minute: the GGUF copied to a new directory, then with no pause (the cold load launched "
          f"{max(r['started_ms'][0] for r in fm):.1f} ms after the copy was closed; the second "
          f"{statistics.median(r['started_ms'][1] for r in fm):.0f} ms after, the last "
          f"{statistics.median(r['started_ms'][5] for r in fm):.0f} ms after) a cold load and five warm ones, "
          f"default options; stock load of the same copy {stock_ms:.1f} ms; warm floor ('every later' above) "
          f"{floor_ms:.1f} ms; medians of {len(fm)} rounds")
    table = first_minute_table("load ms by load k (each a new process)", "load ms",
                               [[(l["load_ms"], l["source_bytes_hashed"]) for l in r["loads"]] for r in fm],
                               stock_ms, "stock", floor_ms)
    same = len({identity(l) for r in fm for l in r["loads"] + [r[stock]]}) == 1
    print(same_text if same else "FIRST-MINUTE OUTPUTS DIFFER")
    report = {"type": args.type, "layers": args.layers, "dim": args.dim, "ffn": args.ffn, "threads": args.threads,
              "rounds": args.rounds, "rows": rows, "identical": same, "stock_ms": stock_ms, "floor_ms": floor_ms,
              "started_ms": [r["started_ms"] for r in fm], "first_minute": table,
              "loads": [[{k: l.get(k) for k in keep} for l in r["loads"]] for r in fm]}
    with open(os.path.join(args.work, f"{name}-first-minute.json"), "w") as f:
        json.dump(report, f, indent=1)
