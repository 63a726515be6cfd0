# SPDX-License-Identifier: MIT
# plot.gp: the round-trip chart of bench/README.md, from the data file shmref-bench
# writes with --plot-data (one row per size, one column per method, "?" = not measured).
#   gnuplot -e "datafile='roundtrip.dat'; outfile='roundtrip.png'" bench/plot.gp
if (!exists("datafile")) datafile = "roundtrip.dat"
if (!exists("outfile")) outfile = "roundtrip.png"
if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1400,720 font "sans,11" noenhanced
set output outfile
set datafile separator "\t"
set datafile missing "?"

set title "No-op round trip: client heap array -> server process -> same-size array back, read by the client\n".subtitle
set ylabel "median round trip (ms, log scale)"
set xlabel "array size"
set logscale y
set format y "%g"
set grid ytics mytics
set mytics 10
set key outside right top vertical
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0.0002:*]

# One colour per method: alternatives in warm greys and oranges, shmrefd in blues
# (one-copy) and greens (zero-copy), light for /dev/shm and dark for huge pages.
# iceoryx (the same work as shmref-pubsub, through its own shared memory) in purples.
array colours[12] = ["#9e9e9e", "#795548", "#ff9800", "#ffc107", "#90caf9", "#1565c0", \
                     "#a5d6a7", "#2e7d32", "#80cbc4", "#00695c", "#8e24aa", "#212121"]
ncols = 12
plot for [c=2:ncols+1] datafile using c:xtic(1) title columnheader(c) lc rgb colours[c-1]
