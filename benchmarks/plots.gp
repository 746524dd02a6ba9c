# Plots for docs/BENCHMARKS.md from the data files weightcache-bench writes to
# $WEIGHTCACHE_BENCH_DATA. benchmarks/run calls:  gnuplot -e "data='DIR'; out='DIR'" plots.gp
if (!exists("data")) data = "build/bench/plot-data"
if (!exists("out")) out = "docs/benchmarks"

set terminal pngcairo size 820,460 font "sans,10" noenhanced
set grid ytics lc rgb "#dddddd"
set key top left
set border 3
set tics nomirror

# ---- warm and cold loads against repacking ---------------------------------------------------
if (system("test -s ".data."/load.dat && echo 1") eq "1") {
  set output out."/load.png"
  set terminal pngcairo size 900,540 font "sans,10" noenhanced
  set rmargin 14
  set title "Demo model, 576 MiB: weights ready, ms of wall time (lower is better)"
  set style fill solid 0.85 border -1
  set boxwidth 0.7
  set xtics rotate by -35 left font ",9"
  set ylabel "ms"
  set yrange [0:*]
  set bmargin 9
  set key off
  color(g) = g == 0 ? 0xc0392b : (g == 1 ? 0x27ae60 : 0x2e86c1)
  plot data."/load.dat" using 0:2:(color($4)):xtic(1) with boxes lc rgb variable, \
       "" using 0:2:(sprintf("%.0f", $2)) with labels offset 0,0.7 font ",8"
  set xtics norotate font ",10"
  set bmargin
  set rmargin
  set terminal pngcairo size 820,460 font "sans,10" noenhanced
  set key top left
  set yrange [*:*]
}

# ---- cost per entry vs entry count -------------------------------------------------------------
if (system("test -s ".data."/scale.dat && echo 1") eq "1") {
  set output out."/scale.png"
  set title "Cost per entry as the cache grows (CPU ns, log-log; 64-byte entries)"
  set logscale xy
  set xlabel "entries in the cache"
  set ylabel "ns"
  set format x "10^{%L}"
  set terminal pngcairo size 820,460 font "sans,10" enhanced
  set key top left Left reverse
  plot data."/scale.dat" using 1:2 with linespoints lw 2 pt 7 lc rgb "#c0392b" title "reserve + fill + look\\_up\\_or\\_insert", \
       "" using 1:3 with linespoints lw 2 pt 5 lc rgb "#27ae60" title "look\\_up of a hit (random key)", \
       "" using 1:4 with linespoints lw 1 dt 2 pt 4 lc rgb "#27ae60" title "std::unordered\\_map::find, same keys (floor)", \
       "" using 1:5 with linespoints lw 1 pt 9 lc rgb "#2e86c1" title "warm open, per entry", \
       "" using 1:6 with linespoints lw 1 pt 11 lc rgb "#8e44ad" title "finalize, per entry"
  set terminal pngcairo size 820,460 font "sans,10" noenhanced
  set key top left noreverse Right
  unset logscale; unset xlabel; set format x "% h"
}

# ---- reader threads ----------------------------------------------------------------------------
if (system("test -s ".data."/threads.dat && echo 1") eq "1") {
  set output out."/threads.png"
  set title "look_up of verified hits, 10,000 entries: look-ups per second by all N threads (2 cores)"
  set xlabel "reader threads"
  set ylabel "million look-ups per second, all threads"
  set logscale x 2
  set xrange [0.8:10]
  set xtics (1, 2, 8)
  set yrange [0:*]
  set key bottom right
  plot data."/threads.dat" using 1:6 with linespoints lw 2 pt 7 lc rgb "#27ae60" title "weightcache look_up", \
       "" using 1:8 with linespoints lw 1 pt 5 lc rgb "#7f8c8d" title "unordered_map + shared_mutex", \
       "" using 1:7 with linespoints lw 1 dt 2 pt 4 lc rgb "#7f8c8d" title "unordered_map::find, no lock"
  set key top left
  set xrange [*:*]
  unset logscale; set xtics autofreq; set yrange [*:*]
}

# ---- the k-th process --------------------------------------------------------------------------
if (system("test -s ".data."/kth.dat && echo 1") eq "1") {
  set output out."/processes.png"
  set title "k-th process: open the warm 10,000-entry cache + look up every key, while k-1 others hold it"
  set xlabel "k"
  set ylabel "ms"
  set xrange [0.5:8.5]
  set yrange [0:*]
  plot data."/kth.dat" using 1:4 with linespoints lw 2 pt 7 lc rgb "#8e44ad" title "Verify::first_use (checksums 254 MiB), wall", \
       "" using 1:5 with linespoints lw 1 dt 2 pt 6 lc rgb "#8e44ad" title "Verify::first_use, CPU", \
       "" using 1:2 with linespoints lw 2 pt 5 lc rgb "#2e86c1" title "Verify::none, wall", \
       "" using 1:3 with linespoints lw 1 dt 2 pt 4 lc rgb "#2e86c1" title "Verify::none, CPU"
  set xrange [*:*]; set yrange [*:*]
}

# ---- memory of N processes -----------------------------------------------------------------------
if (system("test -s ".data."/memory.dat && echo 1") eq "1") {
  set output out."/memory.png"
  set title "N processes each holding the 132 MiB model: sum of Pss and of Private_Dirty (MiB)"
  set xlabel "processes"
  set ylabel "MiB"
  set xrange [0.5:8.5]
  set yrange [0:*]
  set xtics (1, 2, 4, 8)
  plot data."/memory.dat" using 1:4 with linespoints lw 2 pt 7 lc rgb "#c0392b" title "heap repack: Pss", \
       "" using 1:5 with linespoints lw 1 dt 2 pt 6 lc rgb "#c0392b" title "heap repack: Private_Dirty", \
       "" using 1:2 with linespoints lw 2 pt 5 lc rgb "#27ae60" title "shared cache: Pss", \
       "" using 1:3 with linespoints lw 1 dt 2 pt 4 lc rgb "#27ae60" title "shared cache: Private_Dirty"
  set xrange [*:*]; set yrange [*:*]; set xtics autofreq
}

# ---- chunked mappings vs one mmap per reserve --------------------------------------------------
if (system("test -s ".data."/strategy.dat && echo 1") eq "1") {
  set output out."/strategy.png"
  set title "10,000 weights of 16 B-256 KiB: chunked mappings vs ftruncate + mmap per reserve (ms, log)"
  unset xlabel
  set ylabel "ms (wall)"
  set logscale y
  set style data histograms
  set style histogram clustered gap 1
  set style fill solid 0.85 border -1
  set key top left
  plot data."/strategy.dat" using 2:xtic(1) lc rgb "#27ae60" title "weightcache (chunked, 1 VMA)", \
       "" using 3 lc rgb "#c0392b" title "ftruncate + mmap per reserve (10,000 VMAs)"
  unset logscale
}

# ---- a current XNNPACK: runtime creation in fresh processes (weightcache-xnn-bench) ------------
if (system("test -s ".data."/xnn_launch.dat && echo 1") eq "1") {
  set output out."/xnn_launch.png"
  set terminal pngcairo size 980,520 font "sans,10" noenhanced
  set title "XNNPACK runtime creation, fresh processes: median ms (log scale, lower is better)"
  unset xlabel
  set ylabel "ms (wall)"
  set logscale y
  set yrange [0.1:*]
  set style data histograms
  set style histogram clustered gap 1
  set style fill solid 0.85 border -1
  set boxwidth 0.9 relative
  set xtics font ",9"
  set key outside bottom center horizontal maxrows 2
  plot data."/xnn_launch.dat" using 2:xtic(1) lc rgb "#c0392b" title "XNNPACK packs (no cache)", \
       "" using 3 lc rgb "#e67e22" title "cold: packs into the cache", \
       "" using 4 lc rgb "#f1c40f" title "warm, first process (verifies)", \
       "" using 5 lc rgb "#27ae60" title "warm, later processes (shared)", \
       "" using 6 lc rgb "#2e86c1" title "warm, first_use (per process)"
  unset logscale
  set yrange [*:*]
  set key top left
  set xtics font ",10"
  set terminal pngcairo size 820,460 font "sans,10" noenhanced
}
if (system("test -s ".data."/xnn_kth.dat && echo 1") eq "1") {
  set output out."/xnn_kth.png"
  set title "The k-th process to create the XNNPACK runtime after a change (median ms, log)"
  set xlabel "k (1 packs, 2 verifies, later ones trust that verification)"
  set key inside top right vertical maxrows auto
  set ylabel "ms (wall)"
  set logscale y
  set xtics 1
  plot for [i=2:5] data."/xnn_kth.dat" using 1:i with linespoints lw 2 pt 7 title columnhead(i)
  unset logscale
  set xtics autofreq
  unset xlabel
}
