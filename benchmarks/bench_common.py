"""What the benchmark scripts share: evicting files from the page cache, removing a cache file, and
a clustered bar chart through gnuplot (nothing when gnuplot is missing)."""
import os
import shutil
import subprocess


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
