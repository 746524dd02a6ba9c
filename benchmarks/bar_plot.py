"""A clustered bar chart through gnuplot, for the benchmark scripts (nothing when gnuplot is missing)."""
import os
import shutil
import subprocess


def bar_plot(png, title, ylabel, labels, series, work):
    """series: [(title, [value per label])]; a log-scale histogram of them into png. False without gnuplot."""
    if not png or not shutil.which("gnuplot"):
        return False
    dat = os.path.join(work, os.path.splitext(os.path.basename(png))[0] + ".dat")
    with open(dat, "w") as f:
        for i, label in enumerate(labels):
            f.write('"{}" {}\n'.format(label, " ".join(str(s[1][i]) for s in series)))
    using = ", ".join(("'{}' using {}:xtic(1)" if k == 0 else "'' using {}").format(dat, k + 2) if k == 0 else
                      "'' using {}".format(k + 2) for k in range(len(series)))
    using = ", ".join(part + f" title '{series[k][0]}'" for k, part in enumerate(using.split(", ")))
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
plot {using}
"""
    subprocess.run(["gnuplot"], input=gp, text=True, check=True)
    return True
